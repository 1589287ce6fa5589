from ._compiled import use_fresh_code

__version__ = "0.2.0"  # semantic versioning; CHANGELOG.md says what each release changed

use_fresh_code()
