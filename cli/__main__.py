"""``python -m unihub.cli``: the ``unihub`` command."""

from unihub.cli import main

raise SystemExit(main())
