"""The `starling` command: serve one service, run a local mesh, check status, admin calls."""
