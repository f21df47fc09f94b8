"""Device memory from a trace (or a static count): the caching allocator replayed, CUDA's own
additions, GPU facts, speed, and the search for the largest batch."""
