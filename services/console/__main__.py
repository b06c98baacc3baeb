import sys

from services.console.main import main

sys.exit(main())
