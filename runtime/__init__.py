"""What every process of unihub needs: memory budgets, progress, signals, worker lifelines."""
