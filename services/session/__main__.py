import sys

from services.session.main import main

sys.exit(main())
