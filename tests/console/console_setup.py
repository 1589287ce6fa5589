"""What the console tests' fixtures (conftest.py) and tests share: the restricted user's password and where a
broker's console is (a module of its own: `conftest` names another directory's module in a run of several)."""
from __future__ import annotations

APP_PASSWORD = "app-secret"


def console_url(broker) -> str:
    return f"http://{broker.config['http']['listen']}/"
