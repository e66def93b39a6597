"""Metric sinks, health detectors and autotune.

Import the submodules directly (`rltune.monitor.detectors`, `.autotune`, `.trackers`): this
package imports nothing, so `rltune diagnose` starts without torch.
"""
