"""``python -m partq.tools``: the same as the ``partq`` console script."""
from partq.tools.cli import main

if __name__ == "__main__":
    main()
