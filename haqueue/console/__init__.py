"""The web console (design/console.md): pages and a JSON API served by every broker on an HTTP(S) listener of
its own. A plug-in: nothing in broker/, ha/ or store/ knows of it; the CLI plugs it in last, giving it what it
reads."""
from .plugin import serve_console

__all__ = ["serve_console"]
