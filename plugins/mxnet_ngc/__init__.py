"""placeholder"""
import accelbench

@accelbench.hookimpl
def register_backends(register):
    pass
