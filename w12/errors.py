"""The package's one error type: everything a user can cause is reported through it."""


class W12Error(Exception):
    """A user-facing error: bad input, a corrupt or foreign file, a refused operation.

    The message is one line naming the file, tensor and value at fault; the CLI prints it and
    exits with code 2.
    """
