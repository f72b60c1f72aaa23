"""Developer tools: the multi-node test cluster (netns_cluster)."""
