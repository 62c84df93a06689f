"""``python -m headcut`` (and ``accelerate launch -m headcut ...``): the command line."""

from .cli import main

if __name__ == "__main__":
    main()
