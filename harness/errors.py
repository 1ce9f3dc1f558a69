"""Errors caused by what the user gave us (an op name, a preset, a CSV, a YAML file)."""


class UserError(ValueError):
    """Bad input from the user: the message is one line that names the problem.

    The CLI prints it without a traceback and exits with status 2.
    """
