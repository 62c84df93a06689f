"""headcut's user-facing error: the CLI prints its message on one line and exits with code 2."""


class HeadcutError(Exception):
    """A problem with the user's input (path, mask, budget, flag) that headcut refuses to work with."""
