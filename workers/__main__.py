"""``python -m workers ...`` is the ``mnemos`` command."""

from workers.cli import main

if __name__ == "__main__":
    main()
