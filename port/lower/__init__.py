"""Lowering: plan events -> kernel calls with offsets in one arena (the Program), the arena planner and the
program check. Pure: nothing here touches hardware."""
