"""``python -m game.cli``: the same entry point as the ``vgame`` console script."""

from game.cli import main

if __name__ == "__main__":
    main()
