"""The analytics commands of `handoffs`: each module's `register(subparsers)` adds its own.

Kept apart from the loaders so that building the parser (`handoffs serve` does) loads no
pandas: a command imports what it runs when it runs.
"""
