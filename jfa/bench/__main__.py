"""``python -m jfa.bench ...``: same as ``jfa bench ...``."""

from .runner import main

raise SystemExit(main())
