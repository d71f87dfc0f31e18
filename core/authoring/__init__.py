"""For plugin authors: ``accelbench new-plugin`` (``scaffold``), the contract fixture (``contract``),
the pytest plugin (``pytest_plugin``) and the docs' generated tables (``docgen``)."""
