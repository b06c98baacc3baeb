import sys

from services.queue.main import main

sys.exit(main())
