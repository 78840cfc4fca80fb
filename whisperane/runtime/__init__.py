"""The backend boundary: bundles, executors, Core ML, decoder states and adapters, sessions, the loaded model."""
