"""What we DO to a subgraph: recipes, transformations, code generation, build/run/validate, search."""
