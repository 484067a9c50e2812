"""The pure core: the model, classification into buckets, placement, demand, consolidation and plan().

No I/O, no clock, no SDK: adapters and the daemon import the core, never the reverse."""
