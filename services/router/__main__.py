import sys

from services.router.main import main

sys.exit(main())
