#[distlock::locked(locks = locks, name = "report", wait = "1s", wait = "2s")]
async fn report(locks: &distlock::Locks) -> distlock::Result<()> {
    Ok(())
}

fn main() {}
