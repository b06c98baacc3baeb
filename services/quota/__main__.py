import sys

from services.quota.main import main

sys.exit(main())
