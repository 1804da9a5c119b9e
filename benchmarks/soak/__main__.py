import sys

from benchmarks.soak.harness import main

sys.exit(main())
