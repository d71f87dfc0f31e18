"""Planning: a request read from flags and config files (``config``, ``inputs``), resolved against
each backend's vocabulary before any worker starts (``plan``), and a results file's runs planned
again (``replay``)."""
