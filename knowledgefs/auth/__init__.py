"""Who is calling: principals, Dify capability tokens, the inner API key and route operations."""
