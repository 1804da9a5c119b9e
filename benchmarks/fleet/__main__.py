import sys

from benchmarks.fleet.main import main

sys.exit(main())
