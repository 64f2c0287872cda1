"""Tools that multi-turn workflows give the policy: the call syntax and the search index."""
