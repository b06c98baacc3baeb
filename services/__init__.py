"""Starling's services (docs/architecture.md). Importing the package first decides which core
runs: the mypyc-compiled codec, topic trie and channel, or the same modules as Python
(services/compiled.py; `STARLING_PURE=1` asks for Python).
"""

from services.compiled import install

install()
