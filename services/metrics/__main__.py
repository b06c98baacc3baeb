import sys

from services.metrics.main import main

sys.exit(main())
