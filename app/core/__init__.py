"""Pure math, units and limits: no I/O, nothing imported from the rest of ``app``."""
