"""The online conversion to partitioned storage on a large table with a worker running."""
