"""`python -m port.cli ...`: the same as the `port` command."""
from port.cli import main

main()
