"""What a subgraph IS: graph IR, importers, partitioner, loop nests, static features, encoders."""
