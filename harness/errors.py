"""The one exception type for mistakes a user can make (bad config, missing model, no CUDA, ...).

Runners catch it, print its message as one line on stderr and exit with code 2; anything else is a bug
and keeps its traceback.
"""


class UserError(Exception):
    """An error caused by the user's input or environment, reported as one clear line (exit code 2)."""
