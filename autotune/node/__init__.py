"""The node side: run one trial on a GPU node (launch, watch the log, benchmark, stop), the pools that
hand trials to nodes, the runners that reach them (this machine or SSH), the node check and lock.
Nothing here imports Optuna; Fabric is loaded only for a node reached over SSH."""
