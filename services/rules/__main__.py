import sys

from services.rules.main import main

sys.exit(main())
