#[distlock::locked(locks = locks, name = "report", wait = "5 seconds")]
async fn report(locks: &distlock::Locks) -> distlock::Result<()> {
    Ok(())
}

#[distlock::locked(locks = locks, name = "audit", lease = "0s")]
async fn audit(locks: &distlock::Locks) -> distlock::Result<()> {
    Ok(())
}

fn main() {}
