"""`python -m services.session`: runs the session service (services/session/main.py)."""

import sys

from services.session.main import main

sys.exit(main())
