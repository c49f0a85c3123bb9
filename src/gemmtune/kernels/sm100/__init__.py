"""Blackwell (sm_100a): the rules of its configuration space. Its kernel comes in a later issue;
until then its configs can be enumerated and checked on the CPU but not compiled or run."""
