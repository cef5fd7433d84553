"""``python -m unihub``: the ``unihub`` command, as the console script and ``python -m unihub.cli`` run it."""

from unihub.cli import main

raise SystemExit(main())
