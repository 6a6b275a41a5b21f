"""`python -m annotated_s4 train|evaluate|sample|reference ...`: the command line."""

from .cli import main

main()
