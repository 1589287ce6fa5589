from ._compiled import use_fresh_code

__version__ = "0.1.0"

use_fresh_code()
