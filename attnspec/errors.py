"""What the `attnspec` command and its subcommands share, in a module that imports nothing of theirs."""


class UserError(Exception):
    """A problem with what the user asked for: printed as one line, exit code 2."""
