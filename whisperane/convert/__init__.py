"""The build side: checkpoint loaders, torch modules and exporters. The only place torch is imported."""
