"""The process itself: request budgets, change counting, kept values, memory, resource paths and the one scheduler."""
