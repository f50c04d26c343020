"""``python -m partq``: the ``partq`` command."""
from partq.tools.cli import main

if __name__ == "__main__":
    main()
