import sys

from services.connection.main import main

sys.exit(main())
