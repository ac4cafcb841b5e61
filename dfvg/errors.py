"""The one exception type for mistakes a user can fix.

A `UserError` carries a single line that says what is wrong and how to fix it. The CLI and the scripts
print it without a traceback and exit with status 2; everything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A bad input (missing file, wrong shape, unknown model type, bad config value)."""
