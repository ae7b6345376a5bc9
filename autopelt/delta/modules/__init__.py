"""The nn.Modules a delta is built from. Each wraps or sits beside a frozen base module; none edits one."""
