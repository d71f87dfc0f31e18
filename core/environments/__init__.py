"""What runs stand on: this machine and its provenance (``machine``), worker Python environments made
on first use (``python_envs``), datasets (``datasets``) and the locks that guard what is made in the
cache (``locks``)."""
