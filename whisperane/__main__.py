from .command import entry

entry()
