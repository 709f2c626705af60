"""Population-based training: the config (`config`), its checks (`validation`), the pure
decisions (`controller`: rank, exploit, explore) and the lineage file (`lineage`). The
population's threads live in `podrace.runtime.population`."""
