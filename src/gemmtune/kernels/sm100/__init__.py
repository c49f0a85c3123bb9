"""Blackwell (sm_100a): the rules of its configuration space. It has no kernel yet: its configs
can be enumerated and checked on the CPU but not compiled or run."""
